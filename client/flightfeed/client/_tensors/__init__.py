"""Arrow to torch on the host: fixed-width and tensor columns, ragged columns, packed token windows."""
