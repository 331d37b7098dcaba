"""Staging buffers: batches land in reused memory, with the values (and padding) torch.stack and
pad_collate would give, and the number of buffers stays bounded however many shapes go by."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from soakd.request import Request
from soakd.targets.staging import StagingBuffers


def pad_collate(batch: list[Request]) -> torch.Tensor:
    """The batch assembly soakd had before staging buffers (the reference they must match):
    stack, right-padding 1-D token sequences with 0 to the longest when lengths differ."""
    tensors = [r.tensor for r in batch]
    first = tensors[0].shape
    if all(t.shape == first for t in tensors):
        return torch.stack(tensors)
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=0)


def requests(tensors: list[torch.Tensor]) -> list[Request]:
    return [Request(0.0, 0.0, tuple(t.shape), t) for t in tensors]


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_same_key_reuses_one_buffer_with_each_batchs_values() -> None:
    """Batches of one (size, shape, dtype) come back in the same memory, each holding its own requests."""
    staging = StagingBuffers()
    ptrs = set()
    for i in range(5):
        items = [randn(3, 8, 8, seed=10 * i + j) for j in range(4)]
        x = staging.stack(items)
        torch.testing.assert_close(x, torch.stack(items), rtol=0, atol=0)
        ptrs.add(x.data_ptr())
    assert len(ptrs) == 1
    assert len(staging) == 1


def test_each_key_has_its_own_buffer_and_gets_it_back() -> None:
    """Another batch size, shape or dtype gets another buffer; the first key's buffer is still its own."""
    staging = StagingBuffers()
    a = staging.stack([randn(16, seed=i) for i in range(8)]).data_ptr()
    others = {
        staging.stack([randn(16, seed=i) for i in range(4)]).data_ptr(),  # batch size
        staging.stack([randn(32, seed=i) for i in range(8)]).data_ptr(),  # shape
        staging.stack([randn(16, seed=i).double() for i in range(8)]).data_ptr(),  # dtype
    }
    assert a not in others and len(others) == 3
    assert staging.stack([randn(16, seed=9 + i) for i in range(8)]).data_ptr() == a
    assert len(staging) == 4


def test_buffer_count_is_bounded_under_many_keys() -> None:
    """A run that sees hundreds of shapes holds at most ``capacity`` buffers; evictions count the churn."""
    staging = StagingBuffers(capacity=4)
    for n in range(1, 201):
        x = staging.stack([torch.full((n,), float(n)), torch.full((n,), -float(n))])
        assert x.shape == (2, n) and x[0, -1].item() == n and x[1, 0].item() == -n
        assert len(staging) <= 4
    assert len(staging) == 4
    assert staging.evictions == 196


def test_least_recently_used_is_evicted() -> None:
    """A key in steady use keeps its buffer while one-off shapes come and go."""
    staging = StagingBuffers(capacity=2)
    hot = [randn(8, seed=i) for i in range(3)]
    ptr = staging.stack(hot).data_ptr()
    for n in range(9, 30):
        staging.stack([randn(n, seed=0), randn(n, seed=1)])
        assert staging.stack(hot).data_ptr() == ptr


def test_buffers_fill_inside_and_outside_inference_mode() -> None:
    """A buffer first made during warm-up (inside inference_mode) still fills outside it, and back."""
    staging = StagingBuffers()
    items = [randn(6, seed=i) for i in range(3)]
    with torch.inference_mode():
        ptr = staging.stack(items).data_ptr()
        staging.collate([randn(4, seed=0), randn(2, seed=1)])
    x = staging.stack(items)
    assert x.data_ptr() == ptr
    torch.testing.assert_close(x, torch.stack(items), rtol=0, atol=0)
    torch.testing.assert_close(
        staging.collate([randn(4, seed=0), randn(2, seed=1)]),
        pad_collate(requests([randn(4, seed=0), randn(2, seed=1)])),
        rtol=0,
        atol=0,
    )
    with torch.inference_mode():
        assert staging.stack(items).data_ptr() == ptr


def test_batch_of_one_on_cpu_is_the_requests_own_tensor() -> None:
    """Nothing to assemble: as before, a single request is a view of its tensor, not a copy."""
    staging = StagingBuffers()
    t = randn(3, 4, seed=0)
    x = staging.stack([t])
    assert x.shape == (1, 3, 4) and x.data_ptr() == t.data_ptr()
    assert len(staging) == 0


def test_a_held_tensors_batch_of_one_is_made_once() -> None:
    """The source's pooled tensors get their batch-of-one view made once, at hold_pool: every batch
    of one of them is that same view (no new view, a small malloc, per call); others still get theirs."""
    staging = StagingBuffers()
    pool = [randn(3, 4, seed=k) for k in range(3)]
    staging.hold_pool(pool)
    first = [staging.stack([t]) for t in pool]
    again = [staging.stack([t]) for t in pool * 2]
    assert all(a is first[k % 3] for k, a in enumerate(again))
    assert all(x.shape == (1, 3, 4) and x.data_ptr() == t.data_ptr() for x, t in zip(first, pool, strict=True))
    other = randn(3, 4, seed=9)
    assert staging.stack([other]) is not staging.stack([other])
    staging.hold_pool([])  # a sweep's next step brings its own pool: the old one is let go
    assert staging.stack([pool[0]]) is not first[0]


def test_padded_sequences_match_pad_collate() -> None:
    """Token sequences of different lengths: right-padded with 0 to the longest, exactly as pad_collate."""
    staging = StagingBuffers()
    lengths_per_batch = [[5, 9, 3, 9], [9, 1, 2, 4], [7, 7, 7, 7], [2, 9, 9, 9]]
    ptrs_for_longest_9 = set()
    for b, lengths in enumerate(lengths_per_batch):
        seqs = [
            torch.randint(1, 1000, (n,), generator=torch.Generator().manual_seed(b * 10 + i))
            for i, n in enumerate(lengths)
        ]
        x = staging.collate(seqs)
        expected = pad_collate(requests(seqs))
        assert x.dtype == expected.dtype
        torch.testing.assert_close(x, expected, rtol=0, atol=0)
        if max(lengths) == 9:
            ptrs_for_longest_9.add(x.data_ptr())
    # Batches 0, 1 and 3 pad to 9: one buffer, whose stale tokens from batch 0 never leak through.
    assert len(ptrs_for_longest_9) == 1


def test_padded_multidimensional_sequences_match_pad_collate() -> None:
    """Sequences of feature vectors (L, D) pad along L, as pad_sequence does."""
    staging = StagingBuffers()
    for b in range(3):
        seqs = [randn(n, 6, seed=b * 10 + n) for n in (4, 2 + b, 7)]
        torch.testing.assert_close(staging.collate(seqs), pad_collate(requests(seqs)), rtol=0, atol=0)


def test_padding_rejects_mismatched_trailing_dims_like_pad_collate() -> None:
    """Sequences that cannot share a batch raise, as pad_collate does; the engine counts an error."""
    seqs = [torch.zeros(4, 6), torch.zeros(3, 5)]
    with pytest.raises(RuntimeError):
        pad_collate(requests(seqs))
    with pytest.raises(RuntimeError, match="trailing dimensions"):
        StagingBuffers().collate(seqs)


def test_a_second_thread_is_refused() -> None:
    """One StagingBuffers per model thread: sharing one would refill a buffer another call still reads."""
    staging = StagingBuffers()
    staging.stack([torch.zeros(4), torch.ones(4)])
    errors: list[BaseException] = []

    def other() -> None:
        try:
            staging.stack([torch.zeros(4), torch.ones(4)])
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and "per model thread" in str(errors[0])


@pytest.mark.gpu
def test_cuda_stages_in_pinned_memory_and_copies_to_the_device() -> None:
    """On CUDA the host buffer is pinned and reused; each batch arrives on the device with its values."""
    staging = StagingBuffers("cuda")
    for i in range(4):
        items = [randn(3, 32, 32, seed=10 * i + j) for j in range(8)]
        x = staging.stack(items)
        assert x.is_cuda
        torch.testing.assert_close(x.cpu(), torch.stack(items), rtol=0, atol=0)
    (buf,) = staging._buffers.values()
    assert buf.is_pinned()
    one = staging.stack([randn(5, seed=1)])
    assert one.is_cuda and one.shape == (1, 5)


def test_rows_already_holding_their_tensor_are_not_copied_again() -> None:
    """soakd's synthetic pool cycled at a batch size it divides: each row gets the same tensor every
    batch, so after the first batch nothing is copied, and every batch still holds its requests."""
    staging = StagingBuffers()
    pool = [randn(3, 48, 48, seed=i) for i in range(8)]
    for _ in range(5):
        x = staging.stack(pool)
        torch.testing.assert_close(x, torch.stack(pool), rtol=0, atol=0)
    assert staging.rows_copied == 8
    half = [randn(3, 48, 48, seed=100 + i) for i in range(4)]
    torch.testing.assert_close(staging.stack(half + pool[4:]), torch.stack(half + pool[4:]), rtol=0, atol=0)
    assert staging.rows_copied == 12  # only the four new rows


def test_a_changed_source_or_a_model_writing_its_input_is_copied_again() -> None:
    """A row is skipped only while both its source and the buffer are as they were after the copy."""
    staging = StagingBuffers()
    pool = [randn(4096, seed=i) for i in range(4)]
    staging.stack(pool)
    pool[2].add_(1.0)  # the source changed in place
    torch.testing.assert_close(staging.stack(pool), torch.stack(pool), rtol=0, atol=0)
    with torch.inference_mode():
        staging.stack(pool).mul_(0.0)  # a model that writes into its input
    torch.testing.assert_close(staging.stack(pool), torch.stack(pool), rtol=0, atol=0)
    staging.stack(pool[::-1])  # the same tensors in other rows
    torch.testing.assert_close(staging.stack(pool), torch.stack(pool), rtol=0, atol=0)


def test_rows_record_keeps_no_request_alive() -> None:
    """Fresh tensors per batch (sample files) are copied every time and freed once the batch is done."""
    staging = StagingBuffers()
    first = [randn(4096, seed=i) for i in range(4)]
    ref = weakref.ref(first[0])
    staging.stack(first)
    del first
    gc.collect()
    assert ref() is None
    fresh = [randn(4096, seed=10 + i) for i in range(4)]
    torch.testing.assert_close(staging.stack(fresh), torch.stack(fresh), rtol=0, atol=0)
    assert staging.rows_copied == 8


def test_small_rows_are_copied_without_looking() -> None:
    """Below CHECK_ROW_BYTES a row costs more to check than to copy: every batch is copied."""
    staging = StagingBuffers()
    pool = [randn(16, seed=i) for i in range(8)]
    for _ in range(3):
        torch.testing.assert_close(staging.stack(pool), torch.stack(pool), rtol=0, atol=0)
    assert staging.rows_copied == 24
