"""The client's commands: ``flightfeed bench`` and ``flightfeed demo``."""
