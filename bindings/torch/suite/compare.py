"""Compares two junit XML files of torch_dist_suite.py (pytest --junitxml), one per backend: counts side by side
and, for every test the first backend passes and the second does not, the reason from the second's log.

  python3 compare.py gloo.xml zccl.xml [--md]      (Markdown tables with --md)
"""
import re
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    tree = ET.parse(path)
    res = {}
    for tc in tree.iter("testcase"):
        name = tc.get("name")
        t = float(tc.get("time") or 0)
        kind, text = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                kind = "failed" if child.tag == "failure" else "error"
                text = (child.get("message") or "") + "\n" + (child.text or "")
                break
            if child.tag == "skipped":
                kind = "skipped"
                text = child.get("message") or child.text or ""
                break
        res[name] = (kind, t, text)
    return res


EXC = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)|AssertionError)\b:?(.*)$")


def reason(text):
    """The exception a rank raised (the last exception line of each rank's traceback), or the timeout."""
    m = re.search(r"(Process \d+ (terminated or )?timed out after [\d.]+ seconds)", text)
    if m:
        return m.group(1)
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        mm = EXC.match(s)
        if not mm or s.startswith("RuntimeError: Process ") or "exited with error code" in s:
            continue
        # an exception line is followed by a blank line, "To execute", or the next traceback
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if nxt and not nxt.startswith(("To execute", "Traceback", "Process ", "During handling", "The above")):
            # multi-line message: keep its first line and the next
            s = s + " " + nxt
        found.append(s)
    if not found:
        m = re.search(r"exited with error code (\d+)", text)
        return f"exit code {m.group(1)}" if m else (text.strip().splitlines() or ["?"])[0]
    # the most informative: prefer one that is not a bare wrapper
    uniq = []
    for f in found:
        f = re.sub(r"\s+", " ", f)[:400]
        if f not in uniq:
            uniq.append(f)
    return " | ".join(uniq[-2:])


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    md = "--md" in sys.argv
    ref_path, test_path = args
    ref, test = outcomes(ref_path), outcomes(test_path)
    names = sorted(set(ref) | set(test))

    def counts(res):
        c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for k, _, _ in res.values():
            c[k] += 1
        return c, sum(t for _, t, _ in res.values())

    (cr, tr), (ct, tt) = counts(ref), counts(test)
    lref, ltest = ref_path.rsplit("/", 1)[-1].split(".")[0], test_path.rsplit("/", 1)[-1].split(".")[0]
    if md:
        print(f"| | {lref} | {ltest} |\n|---|---|---|")
        for k in ("passed", "failed", "error", "skipped"):
            print(f"| {k} | {cr[k]} | {ct[k]} |")
        print(f"| total | {len(ref)} | {len(test)} |")
        print(f"| sum of test times (s) | {tr:.0f} | {tt:.0f} |")
    else:
        for k in ("passed", "failed", "error", "skipped"):
            print(f"{k:8s} {lref}={cr[k]:4d} {ltest}={ct[k]:4d}")
        print(f"total    {lref}={len(ref):4d} {ltest}={len(test):4d}   time {tr:.0f} s / {tt:.0f} s")

    diff = [n for n in names if ref.get(n, ("",))[0] == "passed" and test.get(n, ("missing",))[0] != "passed"]
    print()
    print(f"{len(diff)} tests {lref} passes and {ltest} does not:")
    if md:
        print(f"\n| test | {ltest} | reason |\n|---|---|---|")
    for n in diff:
        k, _, text = test.get(n, ("missing", 0, ""))
        r = reason(text) if k in ("failed", "error") else text.strip()[:300]
        if md:
            print(f"| `{n}` | {k} | {r.replace('|', '/')} |")
        else:
            print(f"  {n}: {k}: {r}")
    other = [n for n in names if test.get(n, ("",))[0] == "passed" and ref.get(n, ("missing",))[0] != "passed"]
    print()
    print(f"{len(other)} tests {ltest} passes and {lref} does not:")
    for n in other:
        k, _, text = ref.get(n, ("missing", 0, ""))
        r = reason(text) if k in ("failed", "error") else text.strip()[:300]
        print(f"{'| `' + n + '` | ' + k + ' | ' + r.replace('|', '/') + ' |' if md else '  ' + n + ': ' + k + ': ' + r}")
    both = [n for n in names if ref.get(n, ("",))[0] in ("failed", "error") and test.get(n, ("",))[0] in ("failed", "error")]
    print()
    print(f"{len(both)} tests fail on both:")
    for n in both:
        print(f"  {n}: {lref}: {reason(ref[n][2])}")


if __name__ == "__main__":
    main()
