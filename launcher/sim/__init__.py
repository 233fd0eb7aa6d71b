"""dynspec-sim: a simulated SGLang server with a continuous-batching engine model."""
