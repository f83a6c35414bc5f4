"""Write a copy of an experiment file keeping only the named trials (chapter/trial), in chapter order."""
import sys
import yaml

src, dst, *keep = sys.argv[1:]
doc = yaml.safe_load(open(src))
want = {}
for k in keep:
    ch, tr = k.split("/")
    want.setdefault(ch, []).append(tr)
chapters = {}
for name, ch in doc["chapters"].items():
    if name in want:
        trials = [t for t in ch["trials"] if t["name"] in want[name]]
        chapters[name] = {**ch, "trials": trials}
        if ch.get("baseline") not in [t["name"] for t in trials]:
            chapters[name].pop("baseline", None)
doc["chapters"] = chapters
yaml.safe_dump(doc, open(dst, "w"), sort_keys=False)
print("slice:", {k: [t["name"] for t in v["trials"]] for k, v in chapters.items()})
