"""Simple-LSH and Norm-Ranging LSH for maximum inner product search (design §4.1)."""
