from soakd.cli import entry

entry()
