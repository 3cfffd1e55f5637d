"""What the client and the daemon share on the socket: the envelope, the framing, the requests.

Imports only the core and the shared leaves (``hpc_batch.bounds``,
``hpc_batch.defaults``), never the daemon or the client.
"""
