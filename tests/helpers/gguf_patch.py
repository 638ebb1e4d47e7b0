#!/usr/bin/env python3
"""gguf_patch.py: damage a copy of a GGUF for the hostile-input tests (stdlib only).

  gguf_patch.py IN OUT relabel TENSOR TYPE   change TENSOR's type id to TYPE (sizes unchanged in
                                             the file: the data is reinterpreted)
  gguf_patch.py IN OUT nan TENSOR            fill TENSOR's data (f16 or f32) with NaN
Prints nothing; exits 1 when the tensor is not found."""
import struct, sys

def main():
    src, dst, op, name = sys.argv[1:5]
    b = bytearray(open(src, 'rb').read())
    assert b[:4] == b'GGUF'
    ver, n_t, n_kv = struct.unpack_from('<IQQ', b, 4)
    pos = 24
    def rstr(p):
        n, = struct.unpack_from('<Q', b, p)
        return bytes(b[p + 8:p + 8 + n]), p + 8 + n
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def skip_val(t, p):
        if t == 8: return rstr(p)[1]
        if t == 9:
            et, cnt = struct.unpack_from('<IQ', b, p); p += 12
            for _ in range(cnt): p = skip_val(et, p)
            return p
        return p + sizes[t]
    align = 32
    for _ in range(n_kv):
        k, pos = rstr(pos)
        t, = struct.unpack_from('<I', b, pos); pos += 4
        if k == b'general.alignment': align, = struct.unpack_from('<I', b, pos)
        pos = skip_val(t, pos)
    found = None
    infos = []
    for _ in range(n_t):
        nm, pos = rstr(pos)
        nd, = struct.unpack_from('<I', b, pos); pos += 4
        ne = struct.unpack_from('<%dq' % nd, b, pos); pos += 8 * nd
        type_pos = pos
        ty, off = struct.unpack_from('<IQ', b, pos); pos += 12
        infos.append((nm, ne, ty, off, type_pos))
    data0 = pos + (-pos % align)
    for nm, ne, ty, off, type_pos in infos:
        if nm.decode() != name: continue
        found = True
        if op == 'relabel':
            struct.pack_into('<I', b, type_pos, int(sys.argv[5]))
        elif op == 'nan':
            n = 1
            for d in ne: n *= d
            if ty == 1: b[data0 + off:data0 + off + 2 * n] = b'\x00\x7e' * n
            elif ty == 0: b[data0 + off:data0 + off + 4 * n] = b'\x00\x00\xc0\x7f' * n
            else: sys.exit('nan: tensor type %d is not f16/f32' % ty)
    if not found: sys.exit('tensor %s not found' % name)
    open(dst, 'wb').write(b)

main()
