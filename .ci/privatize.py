#!/usr/bin/env python3
# Used once (issue 25 item 7) to turn every internal into pub(crate) and give `pub` back only
# to what tests, benches and the binary name; kept to re-run when the surface grows:
#   python3 .ci/privatize.py --convert   (then fix the dead-code and doc-link warnings it leaves)
"""Make a crate's internals pub(crate): turn every `pub` item in src/ (not fields, not
main.rs) into `pub(crate)`, then build every target and give `pub` back to exactly the items
that tests, benches and the binary name (rustc's "defined here" notes of E0603/E0624)."""
import json, re, subprocess, sys, collections

ITEM = re.compile(r'^(\s*)pub (?=(?:unsafe |async |const )*(?:fn|struct|enum|trait|type|const|static|mod|use|union)\b)')
def convert(files):
    n = 0
    for f in files:
        lines = open(f).read().split('\n')
        for i, l in enumerate(lines):
            m = ITEM.match(l)
            if m:
                lines[i] = m.group(1) + 'pub(crate) ' + l[m.end():]
                n += 1
        open(f, 'w').write('\n'.join(lines))
    return n

def restore(locs):
    by = collections.defaultdict(set)
    for f, line in locs: by[f].add(line)
    n = 0
    for f, ls in by.items():
        lines = open(f).read().split('\n')
        for line in ls:
            l = lines[line - 1]
            new = l.replace('pub(crate) ', 'pub ', 1)
            if new != l: n += 1
            lines[line - 1] = new
        open(f, 'w').write('\n'.join(lines))
    return n

def build(extra):
    p = subprocess.run(['cargo', 'check', '--all-targets', '--keep-going', '--message-format=json'] + extra,
                       capture_output=True, text=True)
    locs, other = set(), []
    for line in p.stdout.splitlines():
        try: m = json.loads(line)
        except ValueError: continue
        if m.get('reason') != 'compiler-message': continue
        msg = m['message']
        if msg['level'] != 'error' and not (msg['level'] == 'warning' and 'more private than' in msg['message']): continue
        found = False
        def walk(d):
            nonlocal found
            for c in d.get('children', []):
                for s in c.get('spans', []):
                    if 'defined here' in c['message'] or 'is defined here' in c['message'] or 'declared here' in c['message']:
                        if s['file_name'].startswith('src/'):
                            locs.add((s['file_name'], s['line_start'])); found = True
                walk(c)
        walk(msg)
        for s in msg.get('spans', []):
            if s['file_name'].startswith('src/') and 'defined here' in (s.get('label') or ''):
                locs.add((s['file_name'], s['line_start'])); found = True
        code = (msg.get('code') or {}).get('code')
        named = re.search(r'`([^`]+)` is (?:only public within the crate|private)', msg['message']) or re.search(r'crate-private type `([^`]+)` in public interface', msg['message']) or re.search(r'(?:type|trait) `([^`]+)` is more private than the item', msg['message'])
        if named and (code in ('E0365', 'E0364') or not found):
            name = named.group(1).split('<')[0].split('::')[-1]
            for f in subprocess.run(['git', 'ls-files', 'src'], capture_output=True, text=True).stdout.split():
                if not f.endswith('.rs'): continue
                for i, l in enumerate(open(f).read().split('\n'), 1):
                    if re.match(r'\s*pub\(crate\) (?:unsafe |async |const )*(?:fn|struct|enum|trait|type|const|static|mod|union) ' + re.escape(name) + r'\b', l) or (re.match(r'\s*pub\(crate\) use ', l) and re.search(r'\b' + re.escape(name) + r'\b', l)):
                        locs.add((f, i)); found = True
        if not found: other.append(msg['rendered'])
    return locs, other

if __name__ == '__main__':
    files = subprocess.run(['git', 'ls-files', 'src'], capture_output=True, text=True).stdout.split()
    files = [f for f in files if f.endswith('.rs') and f != 'src/main.rs']
    if '--convert' in sys.argv:
        print('converted', convert(files))
    for rnd in range(30):
        locs, other = build([])
        print(f'round {rnd}: {len(locs)} to restore, {len(other)} other errors', flush=True)
        if not locs:
            for o in other[:10]: print(o)
            break
        restore(locs)
