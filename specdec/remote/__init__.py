"""The cloud verifier as a server (`server`), the edge as its client (`client`), and the
messages between them (`protocol`)."""
