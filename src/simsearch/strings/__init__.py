"""CNN-ED: convolutional edit-distance embeddings and string search (design §4.5)."""
