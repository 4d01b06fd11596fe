"""`python -m bench soak`: the server under mixed load. `run` starts the server, runs the load and checks what it
left (the command itself); `load` holds the client loops of the load phase; `clients` the clients and what
they record, all against 127.0.0.1 only."""
