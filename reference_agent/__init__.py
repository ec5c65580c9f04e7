"""Key-and-door reference agent (lesson “Practice: a key-and-door tool agent”): env, tokenizer, GRU actor–critic, trainer, replay, demo.

Modules, top to bottom: env.py (task, controller mask, Φ, verifier), tokenizer.py (fixed vocabulary and
template), policy.py (recurrent actor–critic, decoding distribution, safetensors checkpoints), train.py
(collection, update, logging, evaluation), replay.py (log-prob recomputation), demo.py (entry points).
"""
