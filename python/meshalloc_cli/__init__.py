"""The `meshalloc` command: measure and compare allocators the way the Mesh paper did."""

__version__ = "0.1.0"
