"""Safetensors case files (SPEC §9) read and written by hand, with numpy only.

A tensor is held as a pair (dtype, values). dtype is the safetensors type name: 'F32', 'F16',
'BF16', 'I32' or 'U32'. For a float type, values is a float64 array of values that the type
can represent exactly; for an integer type, an int64 array.
"""
import json
import struct

import numpy as np

FLOAT_TYPES = ('F32', 'F16', 'BF16')
BF16_MAX = 3.3895313892515355e38
_SIGNIFICAND_BITS = {'F32': 24, 'F16': 11, 'BF16': 8}
_MIN_NORMAL_EXP = {'F32': -126, 'F16': -14, 'BF16': -126}
_WIDTH = {'F32': 4, 'F16': 2, 'BF16': 2, 'I32': 4, 'U32': 4}


def round_to(dtype, x):
    """x rounded once, to nearest-even, to the float type dtype; returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == 'F32':
        with np.errstate(over='ignore'):
            return x.astype(np.float32).astype(np.float64)
    if dtype == 'F16':
        # numpy converts float64 to float16 directly, rounding once
        with np.errstate(over='ignore'):
            return x.astype(np.float16).astype(np.float64)
    if dtype == 'BF16':
        return _round_bf16(x)
    raise ValueError('not a float type: ' + dtype)


def _round_bf16(x):
    """Round float64 to bfloat16 directly (going through f32 could round twice)."""
    with np.errstate(all='ignore'):
        _, e = np.frexp(x)
        # bf16 keeps 8 significant bits; below the smallest normal the step stays 2^-133
        e = np.maximum(e, -125)
        res = np.ldexp(np.round(np.ldexp(x, 8 - e)), e - 8)
        res = np.where(np.abs(res) > BF16_MAX, np.copysign(np.inf, x), res)
        return np.where(np.isfinite(x), res, x)


def ulp(dtype, x):
    """The unit in the last place of the float type dtype at the magnitudes |x|."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(all='ignore'):
        e = np.floor(np.log2(np.where((x > 0) & np.isfinite(x), x, 1.0)))
    e = np.maximum(e, _MIN_NORMAL_EXP[dtype])
    return np.ldexp(1.0, (e - (_SIGNIFICAND_BITS[dtype] - 1)).astype(int))


def _read(path):
    with open(path, 'rb') as f:
        data = f.read()
    (n,) = struct.unpack('<Q', data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop('__metadata__', None) or {}
    return header, meta, data[8 + n:]


def load(path):
    """Returns (tensors, meta): name -> (dtype, values) and the metadata strings."""
    header, meta, body = _read(path)
    tensors = {}
    for name, info in header.items():
        dtype = info['dtype']
        begin, end = info['data_offsets']
        raw = body[begin:end]
        if dtype == 'F32':
            values = np.frombuffer(raw, dtype='<f4').astype(np.float64)
        elif dtype == 'F16':
            values = np.frombuffer(raw, dtype='<f2').astype(np.float64)
        elif dtype == 'BF16':
            bits = np.frombuffer(raw, dtype='<u2').astype(np.uint32) << 16
            values = bits.view(np.float32).astype(np.float64)
        elif dtype == 'I32':
            values = np.frombuffer(raw, dtype='<i4').astype(np.int64)
        elif dtype == 'U32':
            values = np.frombuffer(raw, dtype='<u4').astype(np.int64)
        else:
            raise ValueError('%s: tensor %s has unsupported type %s' % (path, name, dtype))
        tensors[name] = (dtype, values.reshape(info['shape']))
    return tensors, meta


def load_bits(path):
    """name -> the tensor's elements as unsigned integers of their width (their exact bits)."""
    header, _, body = _read(path)
    out = {}
    for name, info in header.items():
        begin, end = info['data_offsets']
        width = _WIDTH[info['dtype']]
        out[name] = np.frombuffer(body[begin:end], dtype='<u%d' % width).reshape(info['shape'])
    return out


def encode(dtype, values):
    """The little-endian bytes of a tensor of type dtype holding values."""
    values = np.asarray(values)
    if dtype == 'F32':
        return np.ascontiguousarray(values, dtype='<f4').tobytes()
    if dtype == 'F16':
        with np.errstate(over='ignore'):
            return np.ascontiguousarray(values.astype(np.float64).astype('<f2')).tobytes()
    if dtype == 'BF16':
        f32 = round_to('BF16', values).astype(np.float32)
        return np.ascontiguousarray(f32.view(np.uint32) >> 16, dtype='<u2').tobytes()
    if dtype == 'I32':
        return np.ascontiguousarray(values.astype(np.int64).astype('<i4')).tobytes()
    if dtype == 'U32':
        return np.ascontiguousarray(values.astype(np.int64).astype('<u4')).tobytes()
    raise ValueError('unsupported type ' + dtype)


def save(path, tensors, meta=None, raw=None, edit_header=None):
    """Writes a safetensors file.

    tensors: name -> (dtype, values); meta: str -> str. raw: name -> (dtype, shape, bytes) for
    tensors given already encoded (types the contract does not support). edit_header, if given,
    may change the header dict before it is written (to make a malformed file).
    """
    header = {}
    blobs = []
    offset = 0
    encoded = [(name, dtype, list(np.shape(values)), encode(dtype, values))
               for name, (dtype, values) in tensors.items()]
    encoded += [(name, dtype, list(shape), data)
                for name, (dtype, shape, data) in (raw or {}).items()]
    for name, dtype, shape, data in encoded:
        header[name] = {'dtype': dtype, 'shape': shape,
                        'data_offsets': [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if meta is not None:
        header['__metadata__'] = meta
    if edit_header is not None:
        edit_header(header)
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
