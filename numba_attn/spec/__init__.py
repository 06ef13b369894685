"""What is computed, and the right answer (NumPy only, no numba).

* ``problem.py``   — :class:`Problem` (B, H, Hkv, Nq, Nk, D, causal, dtype) and the presets
* ``reference.py`` — the float64 reference, the correctness gate (:func:`check`), output poisoning
* ``errors.py``    — validation of user input and the errors it raises
"""
