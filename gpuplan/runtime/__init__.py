"""Executors of plans with torch.distributed (gloo on CPU, NCCL on GPU); torch loads only here."""
