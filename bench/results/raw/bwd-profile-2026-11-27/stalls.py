import csv,sys,re,collections
f=sys.argv[1]
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stalls=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot=collections.Counter(); byop=collections.Counter(); samples=0
opstall=collections.defaultdict(collections.Counter)
for r in data:
    if len(r)<len(hdr): continue
    src=r[ix['Source']].strip()
    op=re.sub(r'^@!?U?P\w+\s+','',src).split(' ')[0]
    s=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    samples+=s; byop[op]+=s
    for h in stalls:
        v=int(r[ix[h]] or 0); tot[h]+=v; opstall[op][h]+=v
print('samples',samples)
for h,v in tot.most_common(): print(f'  {h:24s} {v:8d} {100*v/samples:5.1f}%')
print('by opcode:')
for op,v in byop.most_common(25):
    top=', '.join(f'{k[6:]}:{100*c/v:.0f}%' for k,c in opstall[op].most_common(3))
    print(f'  {op:28s} {v:8d} {100*v/samples:5.1f}%  {top}')
