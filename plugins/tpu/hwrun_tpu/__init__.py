"""hwrun plugin for Google TPUs: Pallas kernels (JAX), interpret mode on CPU."""
