"""The live page: `/` on the daemon's (and a scenario's) listener, charts pushed over Server-Sent Events.

hub.py keeps bounded rings of decimated BPF samples and the clients' bounded queues; app.py is the HTTP side
(its routes on the server: page, static files, the event stream); vendor.py fetches the pinned chart library
at build time.
"""
