"""peers.json rebuilt from peers.log (call 3's peers.json did not come back from the device):
each `[ t] CASE IMPL PASS: SHOWN (NOTE)` line as peers.py's Report.add printed it. The flex
BlockMask's bytes are not in the log and are left out."""
import json, re, sys
log, out = sys.argv[1], sys.argv[2]
lines = open(log).read().splitlines()
head = re.match(r"(.*?), (\{.*\}): ", lines[0])
doc = {"tool": "peers", "gpu": head.group(1), "date": sys.argv[3], "versions": eval(head.group(2)), "results": []}
for line in lines[1:]:
    m = re.match(r"\[\s*\d+s\] (\S+) (\S+) (fwd|bwd|prep): (\S+)(?: ms)?(?: \((.*)\))?$", line)
    if not m:
        continue
    case, impl, pass_, shown, note = m.groups()
    try:
        ms, status = float(shown), "ok"
    except ValueError:
        ms, status = None, shown
    doc["results"].append({"case": case, "impl": impl, "pass": pass_, "status": status, "ms": ms, "note": note or ""})
json.dump(doc, open(out, "w"), indent=1)
print(len(doc["results"]), "results")
