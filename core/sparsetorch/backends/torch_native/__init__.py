"""The pure-PyTorch reference backend: works on any device torch supports, needs no extra package."""
