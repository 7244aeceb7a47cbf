"""The live page: `/` on the daemon's (and a scenario's) listener, charts pushed over Server-Sent Events.

hub.py keeps bounded rings of decimated BPF samples and the clients' bounded queues; app.py is the WSGI
side (page, static files, the event stream); vendor.py fetches the pinned chart library at build time.
"""
