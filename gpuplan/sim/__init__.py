"""Simulation shared by the serving, RL-update and straggler kinds: one discrete-event core
(`core`), the serving engine on top of it (`serving`), request traces (`traces`). Pure Python and
numpy, so models/ may use it to recompute a plan's figures."""
