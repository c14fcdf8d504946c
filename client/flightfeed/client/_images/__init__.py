"""Trainer-side images: decode on the trainer, normalisation and the JPEG decoders."""
