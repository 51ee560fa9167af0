import json,collections,sys
rows=json.load(open(sys.argv[1]))
d=collections.defaultdict(list)
for r in rows: d[(r['method'],r['batch'],r['code'])].append(r['tokens_per_s'])
for (m,b,c) in sorted({(k[0],k[1],'') for k in d}):
    o,n=d[(m,b,'old')],d[(m,b,'new')]
    print(f"| {m} | {b} | {', '.join(map(str,o))} | {', '.join(map(str,n))} | {sum(n)/sum(o):.2f} |")
