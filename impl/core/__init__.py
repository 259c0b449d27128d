"""Sans-I/O protocol cores of the three workers: events in, commands out (see `common`)."""
