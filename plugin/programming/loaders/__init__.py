"""The hardware seam: the only code that programs a card, one loader per way in.

Everything above this package (which function a claim needs, whether the device holds it,
which image file, the per-card lock, waiting for the device to report the new function) is
the same for every loader; everything below it is the kernel or a vendor tool.
"""
