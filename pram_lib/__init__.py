"""pram-release: the maths and data plumbing of protected microdata releases (no Prefect here)."""

__version__ = "0.1.0"
