"""The numerics contract, the bottom layer of zoi (docs/ARCHITECTURE.md): the INT8
primitives every INT8 kernel reproduces (`primitives`) and the numpy reference of every
IR op (`reference`). numpy only; imports nothing else of zoi."""
