"""The reads entry points show, one call per route or page: each takes a session (or the services bundle)
and returns what is to be serialized; none writes, except the change-point windows a history read
computed, stored after the reply through the callback the route hands in."""
