"""ctypes access to libtefl's C ABI for the paired benchmarks (tefl and torch
timed in one process): DLPack structs, a DLTensor view of a contiguous CPU
torch tensor, and tefl_call with its status turned into an exception."""
import ctypes

import torch


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DTYPES = {torch.float32: (2, 32), torch.bfloat16: (4, 16), torch.float16: (2, 16)}


def dl(t, keep):
    """A pointer to a DLTensor viewing `t` (contiguous, CPU); the ctypes
    objects it needs are appended to `keep`, which must outlive the calls."""
    assert t.is_contiguous() and t.device.type == "cpu"
    shape = (ctypes.c_int64 * t.dim())(*t.shape)
    code, bits = _DTYPES[t.dtype]
    d = DLTensor(ctypes.c_void_p(t.data_ptr()), DLDevice(1, 0), t.dim(), DLDataType(code, bits, 1), shape, None, 0)
    keep += [shape, d]
    return ctypes.pointer(d)


def load(path):
    """libtefl at `path`, with tefl_call's and tefl_status_message's types set."""
    lib = ctypes.CDLL(path)
    lib.tefl_call.restype = ctypes.c_void_p
    lib.tefl_status_message.restype = ctypes.c_char_p
    lib.tefl_status_message.argtypes = [ctypes.c_void_p]
    return lib


def bind(lib, op, ins, outs, attrs):
    """A no-argument function that runs tefl_call(op, ins, outs, attrs) with
    the argument arrays built once (ins/outs: dl() pointers or None); a
    non-OK status raises RuntimeError naming the op's message."""
    P = ctypes.POINTER(DLTensor)
    cin, cout = (P * len(ins))(*ins), (P * len(outs))(*outs)
    pattrs = ctypes.byref(attrs) if attrs is not None else None

    def run():
        st = lib.tefl_call(op, cin, len(ins), cout, len(outs), pattrs, None)
        if st:
            raise RuntimeError(lib.tefl_status_message(st).decode())

    run.keep = (cin, cout, attrs)
    return run
