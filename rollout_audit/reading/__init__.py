"""Reading a log: discovery, object storage, casting, sanitizing, records and batches; imports only contract."""
