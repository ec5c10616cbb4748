"""hwrun plugin for AMD Instinct GPUs: Triton tier tuned for CDNA, AITER / FlyDSL adapters."""
