"""Writes the GGUF reader's fuzz seeds (tests/fuzz/corpus/gguf/): small v2 and v3 files with
every metadata value type, arrays, a nested array (refused by the reader), F32, F16, Q8_0 and Q4_0
tensors, and an empty file. Run from the repository root: python3 tests/fuzz/make_gguf_seeds.py"""
import struct, os
def s(x): b=x.encode(); return struct.pack('<Q',len(b))+b
def kv(k,t,v): return s(k)+struct.pack('<I',t)+v
def gguf(kvs, tensors, align=32, version=3):
    out=b'GGUF'+struct.pack('<IQQ',version,len(tensors),len(kvs))
    for k in kvs: out+=k
    off=0; datas=[]
    for name,dims,typ,data in tensors:
        out+=s(name)+struct.pack('<I',len(dims))+b''.join(struct.pack('<Q',d) for d in dims)+struct.pack('<IQ',typ,off)
        datas.append((off,data)); off+=len(data); off=(off+align-1)//align*align
    out+=b'\0'*((-len(out))%align)
    base=len(out); body=bytearray(off)
    for o,d in datas: body[o:o+len(d)]=d
    return out+bytes(body)
d='tests/fuzz/corpus/gguf/'
f32=lambda n: struct.pack('<%df'%n,*[0.5*i for i in range(n)])
basic=[kv('general.architecture',8,s('llama')),kv('llama.block_count',4,struct.pack('<I',1)),
       kv('llama.context_length',4,struct.pack('<I',64)),kv('llama.embedding_length',4,struct.pack('<I',8)),
       kv('general.alignment',4,struct.pack('<I',32))]
open(d+'minimal.gguf','wb').write(gguf(basic,[('token_embd.weight',[8,4],0,f32(32))]))
arr=[kv('tokenizer.ggml.tokens',9,struct.pack('<IQ',8,3)+s('a')+s('b')+s('<s>')),
     kv('tokenizer.ggml.scores',9,struct.pack('<IQ',6,3)+struct.pack('<3f',0,-1,-2)),
     kv('tokenizer.ggml.token_type',9,struct.pack('<IQ',5,3)+struct.pack('<3i',1,1,3)),
     kv('x.u8',0,b'\x07'),kv('x.i8',1,b'\xff'),kv('x.u16',2,struct.pack('<H',9)),kv('x.i16',3,struct.pack('<h',-9)),
     kv('x.bool',7,b'\x01'),kv('x.u64',10,struct.pack('<Q',1<<40)),kv('x.i64',11,struct.pack('<q',-5)),kv('x.f64',12,struct.pack('<d',2.5)),
     kv('x.nested',9,struct.pack('<IQ',9,1)+struct.pack('<IQ',4,2)+struct.pack('<2I',1,2))]
q8=struct.pack('<e',0.1)+bytes(range(32))  # one Q8_0 block (type 8)
q4=struct.pack('<e',0.1)+bytes(range(16))  # one Q4_0 block (type 2)
open(d+'kinds.gguf','wb').write(gguf(basic+arr,[('a.weight',[32,1],8,q8),('b.weight',[32,2],2,q4+q4),('c',[4,1,1],1,struct.pack('<4e',1,2,3,4))]))
open(d+'v2.gguf','wb').write(gguf(basic[:2],[('t',[2,2],0,f32(4))],version=2))
open(d+'empty.gguf','wb').write(gguf([],[]))
open(d+'kinds_flat.gguf','wb').write(gguf(basic+arr[:-1],[('a.weight',[32,1],8,q8),('b.weight',[32,2],2,q4+q4),('c',[4,1,1],1,struct.pack('<4e',1,2,3,4))]))
