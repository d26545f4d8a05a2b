"""FPGA image files (Intel GBS, Xilinx xclbin) and the node's image library.

Everything here reads and checks images before anything touches a card: which function an
image holds, which interface (PR region, shell) it was built for, and whether the file may be
read at all. Nothing here programs a device.
"""
