# soakd in a container (docker-compose.yml builds it). torch with CUDA comes from the base
# image; the GPU itself from the NVIDIA Container Toolkit, reserved by compose.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/soakd
COPY pyproject.toml README.md ./
COPY soakd ./soakd
# The base image's torch satisfies soakd's `torch>=2.2`; pip leaves it alone.
RUN pip install . \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/soakd --shell /usr/sbin/nologin soakd

USER soakd
WORKDIR /var/lib/soakd
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4)"
ENTRYPOINT ["soakd"]
CMD ["run", "--metrics-addr", "0.0.0.0:9464", "--state-dir", "/var/lib/soakd"]
