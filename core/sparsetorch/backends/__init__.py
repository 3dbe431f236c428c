"""Built-in backends of sparsetorch (registered through the same plugin hook as third parties)."""
