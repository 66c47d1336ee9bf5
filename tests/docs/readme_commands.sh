#!/usr/bin/env bash
# tests/docs/readme_commands.sh SRC — ctest Docs.readme_commands: runs README.md's commands as a new user would, in
# a fresh copy of the source tree (its tracked and untracked-but-not-ignored files, as a clone would have them once
# committed), each with a deadline, and checks that README.md and tests/docs/readme_commands.txt list the same
# commands (see that file's header for its format), that README's C program is examples/hello_allreduce.c, and that
# the installed zccl.pc works without any other .pc file. tools/deps.sh runs with DEPS_DRY_RUN=1: it only names
# the packages it would install.
#
# The copy has no ../shared beside it and its own empty data cache (XDG_CACHE_HOME), so zero_train must fetch the
# digits set itself; when Debian's archive is unreachable that entry is skipped. To save time the copy's build is
# configured with -DZCCL_BUILD_TESTS=OFF before the README's first command runs (the suite is CI's own step), unless
# ZCCL_DOCS_FULL_BUILD=1. Launcher lines whose launcher is missing (torchrun, Open MPI's mpirun) are skipped with the
# reason. Exit status: 0 when nothing failed ("readme_commands: PASSED"), 1 otherwise.
set -uo pipefail
src=$(cd "${1:?usage: readme_commands.sh SRC}" && pwd)
list="$src/tests/docs/readme_commands.txt"
readme="$src/README.md"
fail=0
failed() { echo "FAIL: $*"; fail=1; }

# ---- 1. README.md against the list -------------------------------------------------------------------------------
readme_cmds=$(mktemp)
work=$(mktemp -d /tmp/zccl-readme.XXXXXX)
trap 'rm -rf "$work" "$readme_cmds"' EXIT
# lines of ```sh blocks, then inline spans that start like a command (outside code blocks)
awk '/^```/ { if (inblk) { inblk = 0; next } if ($0 ~ /^```sh$/) { inblk = 1; next } code = !code; next }
     inblk && NF { print "block\t" $0; next }
     !code && !inblk {
       line = $0
       while (match(line, /`[^`]+`/)) {
         span = substr(line, RSTART + 1, RLENGTH - 2)
         if (span ~ / / && span ~ /^(build\/|tools\/|\/opt\/|zcclrun|zccl-|torchrun|mpirun|cmake|ctest|pkg-config|cc |export )/)
           print "inline\t" span
         line = substr(line, RSTART + RLENGTH)
       }
     }' "$readme" >"$readme_cmds"
mapfile -t entries < <(sed -n 's/^readme: //p' "$list")
nblock=0
while IFS=$'\t' read -r kind cmd; do
    if [[ $kind == block ]]; then
        nblock=$((nblock + 1))
        found=0
        for e in "${entries[@]}"; do [[ "$e" == "$cmd" ]] && found=1 && break; done
        ((found)) || failed "README.md's command is not in tests/docs/readme_commands.txt: $cmd"
    else
        found=0
        for e in "${entries[@]}"; do [[ "$e" == *"$cmd"* ]] && found=1 && break; done
        ((found)) || failed "README.md's inline command \`$cmd\` is not (part of) an entry of tests/docs/readme_commands.txt"
    fi
done <"$readme_cmds"
for e in "${entries[@]}"; do
    grep -qF -- "$e" "$readme" || failed "tests/docs/readme_commands.txt lists a command README.md does not have: $e"
done
echo "README.md: $nblock command lines in sh blocks, ${#entries[@]} entries in the list"
# the "Using it" program is examples/hello_allreduce.c, byte for byte
if ! diff <(awk '/^```c$/ { on = 1; next } /^```/ { on = 0 } on' "$readme") "$src/examples/hello_allreduce.c" >"$work/c.diff"; then
    failed "README.md's C program differs from examples/hello_allreduce.c:"
    head -20 "$work/c.diff"
fi

# ---- 2. a fresh copy, and the commands -------------------------------------------------------------------------
tree="$work/zccl"
mkdir -p "$tree"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf - --ignore-failed-read 2>/dev/null) |
        tar xf - -C "$tree"
else
    (cd "$src" && tar cf - --exclude=./build --exclude='./build-*' .) | tar xf - -C "$tree"
fi
[[ -f "$tree/README.md" ]] || { failed "could not copy the source tree"; exit 1; }
# DEPS_DRY_RUN: tools/deps.sh only names what it would install (a test installs nothing)
export XDG_CACHE_HOME="$work/cache" PREFIX="$work/prefix" DEPS_DRY_RUN=1
unset ZCCL_SECRET RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK
if [[ "${ZCCL_DOCS_FULL_BUILD:-0}" != 1 ]]; then
    (cd "$tree" && cmake -S . -B build -DZCCL_BUILD_TESTS=OFF >"$work/preconfig.log" 2>&1) ||
        { failed "cmake -DZCCL_BUILD_TESTS=OFF in the copy:"; tail -20 "$work/preconfig.log"; }
fi

free_port() { # a TCP port nothing listens on, and the next one too (torchrun's store and zccl's root)
    python3 -c 'import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(50):  # below the ephemeral range: no connect() is handed the port as its source port
    a = socket.socket(); p = random.randrange(20000, max(lo - 1, 20001))
    try:
        a.bind(("", p)); b = socket.socket(); b.bind(("", p + 1)); b.close(); a.close(); print(p); break
    except OSError: a.close()' 2>/dev/null || echo $((20000 + RANDOM % 10000))
}

nrun=0
nskip=0
run_entry() { # readme run needs expect timeout
    local readme=$1 run=$2 needs=$3 expect=$4 to=${5:-180}
    case "$run" in
    self) echo "SELF: $readme (this test)"; return ;;
    ci)
        local want=${readme/tools\/deps.sh --test/tools/deps.sh --test --vm}
        if grep -qxF -- "$want" "$src/.ci/run"; then echo "PASS: $readme (.ci/run runs it, with --vm)"
        else failed ".ci/run does not run the README's test command (with --vm): $want"; fi
        return ;;
    same) run=$readme ;;
    esac
    if [[ -n "$needs" ]] && ! (cd "$tree" && bash -c "$needs") >/dev/null 2>&1; then
        echo "SKIP: $readme (needs: $needs)"
        nskip=$((nskip + 1))
        return
    fi
    local log="$work/log.$((nrun + nskip))" t0=$SECONDS rc
    (cd "$tree" && PORT=$(free_port) timeout -k 10 "$to" bash -c "$run" </dev/null >"$log" 2>&1)
    rc=$?
    if ((rc == 0)) && [[ -n "$expect" ]] && ! grep -qE -- "$expect" "$log"; then rc=-1; fi
    if ((rc == 0)); then
        echo "PASS: $readme ($((SECONDS - t0)) s)"
        nrun=$((nrun + 1))
    elif [[ "$readme" == *zero_train* ]] && grep -q "could not fetch the digits set" "$log"; then
        echo "SKIP: $readme (Debian's archive unreachable: fetch_digits.sh failed)"
        grep fetch_digits "$log" | tail -3
        nskip=$((nskip + 1))
    else
        ((rc == 124 || rc == 137)) && failed "$readme: no result within $to s" ||
            failed "$readme: $( ((rc == -1)) && echo "output does not match /$expect/" || echo "exit status $rc")"
        echo "  ran: $run"
        tail -25 "$log" | sed 's/^/  | /'
    fi
}

readme="" run="" needs="" expect="" to=""
while IFS= read -r line || [[ -n "$line" ]]; do
    case "$line" in
    readme:*)
        [[ -n "$readme" ]] && run_entry "$readme" "$run" "$needs" "$expect" "$to"
        readme=${line#readme: } run="" needs="" expect="" to="" ;;
    run:*) run=${line#run: } ;;
    needs:*) needs=${line#needs: } ;;
    expect:*) expect=${line#expect: } ;;
    timeout:*) to=${line#timeout: } ;;
    esac
done <"$list"
[[ -n "$readme" ]] && run_entry "$readme" "$run" "$needs" "$expect" "$to"

if ((fail)); then
    echo "readme_commands: FAILED"
    exit 1
fi
echo "readme_commands: PASSED ($nrun commands ran, $nskip skipped)"
