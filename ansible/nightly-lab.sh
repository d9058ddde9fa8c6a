#!/usr/bin/env bash
# The hardware nightly, step by step: what .github/workflows/nightly-lab.yml runs on the lab's
# controller, and tests/test_rehearsal.py on the rehearsal lab. docs/nightly.md describes it.
#
#   ansible/nightly-lab.sh [--inventory FILE] [--results DIR] [--playbook FILE] [--venv DIR]
#                          [--skip setup,provision] [--dry-run]
#
# Steps, in order, each logged with its name (setup and provision can be skipped):
#   setup      make setup: apt packages (through sudo -n unless root) and the .venv
#   vault      $LAB_VAULT_PASSWORD written to a file of this run (mode 0600), named by
#              ANSIBLE_VAULT_PASSWORD_FILE for every later step (Ansible and testbed both
#              decrypt lab_protocol_key) and removed on exit, whatever happened
#   provision  ansible-playbook -i INVENTORY ansible/site.yml
#   run        testbed run PLAYBOOK --inventory INVENTORY --out RESULTS
#   report     testbed report RUN
#   compare    testbed compare RESULTS/last-good RUN (no last good run: RUN becomes the baseline)
#   dashboard  testbed dashboard RESULTS (RUN/dashboard.html, RESULTS/index.html)
#   last-good  RESULTS/last-good -> RUN, only when every step before it passed
# Until the run step has made a run folder, the first step that fails stops the script; after,
# the later steps still run (the run is reported and the dashboard published whatever
# happened). The script ends with the exit status of the first failed step, naming it
# (testbed's codes: 6 some conditions failed, 8 a regression; 2 a bad argument here).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPS=(setup vault provision run report compare dashboard last-good)
SKIPPABLE=(setup provision)

INVENTORY=${LAB_INVENTORY:-}
RESULTS=${LAB_RESULTS:-}
PLAYBOOK=${LAB_PLAYBOOK:-experiments/smoke.yaml}
VENV=${LAB_VENV:-$REPO/.venv}
SKIP=()
DRY_RUN=0
PASSWORD_DIR=""
RUN_DIR=""
CURRENT=""  # the step running now
FAILED_STEP=""
FAILED_RC=0
FINISHED=0

usage() {
    cat <<EOF
usage: ansible/nightly-lab.sh [options]

The hardware nightly: setup, vault, provision, run, report, compare, dashboard, last-good
(see the top of this file and docs/nightly.md).

  --inventory FILE   the lab's Ansible inventory (\$LAB_INVENTORY)
  --results DIR      where run folders, index.html and last-good live (\$LAB_RESULTS)
  --playbook FILE    the experiment playbook (\$LAB_PLAYBOOK; default experiments/smoke.yaml)
  --venv DIR         the virtual environment with testbed and ansible-playbook
                     (\$LAB_VENV; default the checkout's .venv, which the setup step makes)
  --skip STEPS       comma-separated, of: ${SKIPPABLE[*]}
  --dry-run          print each step and its command, run nothing, write nothing

The vault password comes from \$LAB_VAULT_PASSWORD (written to a file for the run, removed on
exit) or, when that is unset, from the file \$ANSIBLE_VAULT_PASSWORD_FILE names (left as it is).
EOF
}

log() { printf '%s nightly: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

bad() {
    printf 'nightly: %s\n' "$*" >&2
    exit 2
}

number() {  # number STEP: "3/8" for the step's place in STEPS
    local i
    for i in "${!STEPS[@]}"; do
        if [[ ${STEPS[i]} == "$1" ]]; then
            echo "$((i + 1))/${#STEPS[@]}"
            return
        fi
    done
}

skipped() {  # skipped STEP: whether --skip named it
    local s
    for s in "${SKIP[@]}"; do [[ $s == "$1" ]] && return 0; done
    return 1
}

step() {  # step NAME COMMAND...: log the step and its command, run it, log how it ended
    local name=$1 start=$SECONDS rc=0 command
    shift
    CURRENT=$name
    printf -v command '%q ' "$@"
    log "step $(number "$name") $name: ${command% }"
    ((DRY_RUN)) && return 0
    "$@" || rc=$?
    if ((rc == 0)); then
        log "step $name: done in $((SECONDS - start)) s"
    else
        log "step $name: FAILED (exit $rc) after $((SECONDS - start)) s"
    fi
    return "$rc"
}

failed() {  # failed STEP RC: keep the first failure
    if [[ -z $FAILED_STEP ]]; then
        FAILED_STEP=$1
        FAILED_RC=$2
    fi
}

announce() {  # announce STEP RC: the step the script failed at
    log "FAILED at step $1 (exit $2)"
    if [[ ${GITHUB_ACTIONS:-} == true ]]; then
        echo "::error::nightly-lab: step $1 failed (exit $2)"
    fi
}

finish() {  # end the script: the first failed step named, its status the script's
    FINISHED=1
    if [[ -n $FAILED_STEP ]]; then
        announce "$FAILED_STEP" "$FAILED_RC"
        exit "$FAILED_RC"
    fi
    if ((DRY_RUN)); then
        log "dry run: nothing was run"
    else
        log "passed: $RUN_DIR"
    fi
    exit 0
}

# shellcheck disable=SC2329  # the EXIT trap's
cleanup() {
    local rc=$?
    # an exit other than finish's (an error of the script's own, Ctrl-C, SIGTERM) in a step
    if ((rc != 0 && !FINISHED)) && [[ -n $CURRENT ]]; then
        announce "$CURRENT" "$rc"
    fi
    if [[ -n $PASSWORD_DIR ]]; then
        rm -rf -- "$PASSWORD_DIR"
        log "vault: password file removed"
    fi
}

output() {  # output KEY VALUE: a step output for the GitHub workflow, where there is one
    if [[ -n ${GITHUB_OUTPUT:-} ]]; then
        echo "$1=$2" >>"$GITHUB_OUTPUT"
    fi
}

run_folders() {  # the folders directly under RESULTS (not links), one a line, sorted
    find "$RESULTS" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | LC_ALL=C sort
}

parse() {
    local s
    while (($#)); do
        case $1 in
            --inventory | --results | --playbook | --venv | --skip)
                (($# >= 2)) || bad "$1 needs a value"
                case $1 in
                    --inventory) INVENTORY=$2 ;;
                    --results) RESULTS=$2 ;;
                    --playbook) PLAYBOOK=$2 ;;
                    --venv) VENV=$2 ;;
                    --skip) IFS=, read -r -a SKIP <<<"$2" ;;
                esac
                shift 2
                ;;
            --dry-run) DRY_RUN=1 && shift ;;
            -h | --help) usage && exit 0 ;;
            *) bad "unknown argument $1 (see --help)" ;;
        esac
    done
    for s in "${SKIP[@]}"; do
        [[ " ${SKIPPABLE[*]} " == *" $s "* ]] || bad "--skip: $s is not one of: ${SKIPPABLE[*]}"
    done
    [[ -n $INVENTORY ]] || bad "no inventory: give --inventory FILE or set LAB_INVENTORY"
    [[ -f $INVENTORY ]] || bad "inventory $INVENTORY: no such file"
    [[ -n $RESULTS ]] || bad "no results folder: give --results DIR or set LAB_RESULTS"
    [[ ! -e $RESULTS || -d $RESULTS ]] || bad "results folder $RESULTS: not a folder"
    # the steps run from the checkout: paths given relative to where the script was called
    INVENTORY=$(realpath -- "$INVENTORY")
    RESULTS=$(realpath -m -- "$RESULTS")
    VENV=$(realpath -m -- "$VENV")
    if [[ -f $PLAYBOOK ]]; then
        PLAYBOOK=$(realpath -- "$PLAYBOOK")
    elif [[ $PLAYBOOK != /* && -f $REPO/$PLAYBOOK ]]; then
        PLAYBOOK=$REPO/$PLAYBOOK
    else
        bad "playbook $PLAYBOOK: no such file"
    fi
    if [[ -z ${LAB_VAULT_PASSWORD:-} ]] && ((!DRY_RUN)); then
        [[ -n ${ANSIBLE_VAULT_PASSWORD_FILE:-} ]] ||
            bad "no vault password: set LAB_VAULT_PASSWORD (or ANSIBLE_VAULT_PASSWORD_FILE)"
        [[ -r $ANSIBLE_VAULT_PASSWORD_FILE ]] ||
            bad "ANSIBLE_VAULT_PASSWORD_FILE=$ANSIBLE_VAULT_PASSWORD_FILE: not a readable file"
    fi
}

vault() {  # the vault password to a file of this run, for every later step
    if [[ -z ${LAB_VAULT_PASSWORD:-} && -n ${ANSIBLE_VAULT_PASSWORD_FILE:-} ]]; then
        log "step $(number vault) vault: ANSIBLE_VAULT_PASSWORD_FILE=$ANSIBLE_VAULT_PASSWORD_FILE" \
            "(the caller's file, left as it is)"
        return
    fi
    local parent=${RUNNER_TEMP:-${TMPDIR:-/tmp}}
    CURRENT=vault
    log "step $(number vault) vault: the password to $parent/nightly-lab.XXXXXX/vault-pass" \
        "(mode 0600, removed on exit)"
    ((DRY_RUN)) && return
    PASSWORD_DIR=$(umask 077 && mktemp -d "$parent/nightly-lab.XXXXXX")
    (umask 077 && printf '%s\n' "$LAB_VAULT_PASSWORD" >"$PASSWORD_DIR/vault-pass")
    unset LAB_VAULT_PASSWORD  # the later steps read the file, not the environment
    export ANSIBLE_VAULT_PASSWORD_FILE=$PASSWORD_DIR/vault-pass
    log "step vault: done: $ANSIBLE_VAULT_PASSWORD_FILE"
}

main() {
    parse "$@"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cd "$REPO"
    export ANSIBLE_CONFIG=$REPO/ansible/ansible.cfg
    local bin=$VENV/bin rc before after sudo=()
    log "inventory $INVENTORY, playbook $PLAYBOOK, results $RESULTS, venv $VENV"

    if skipped setup; then
        log "step $(number setup) setup: skipped (--skip setup)"
    else
        ((EUID == 0)) || sudo=(sudo -n)
        step setup "${sudo[@]}" make -C "$REPO" setup || { failed setup $? && finish; }
    fi

    vault

    if skipped provision; then
        log "step $(number provision) provision: skipped (--skip provision)"
    else
        step provision "$bin/ansible-playbook" -i "$INVENTORY" "$REPO/ansible/site.yml" ||
            { failed provision $? && finish; }
    fi

    CURRENT=run
    ((DRY_RUN)) || mkdir -p "$RESULTS"
    before=$( ((DRY_RUN)) || run_folders)
    rc=0
    step run "$bin/testbed" run "$PLAYBOOK" --inventory "$INVENTORY" --out "$RESULTS" || rc=$?
    ((rc == 0)) || failed run "$rc"
    if ((!DRY_RUN)); then
        after=$(LC_ALL=C comm -13 <(echo "$before") <(run_folders) | sed '/^$/d')
        if [[ -z $after ]]; then
            log "step run: no run folder made under $RESULTS"
            failed run "$((rc ? rc : 1))"
            finish
        fi
        if [[ $after == *$'\n'* ]]; then
            log "step run: more than one new folder under $RESULTS: $(echo "$after" | tr '\n' ' ')"
            failed run "$((rc ? rc : 1))"
            finish
        fi
        RUN_DIR=$RESULTS/$after
        log "step run: run folder $RUN_DIR"
        output run_dir "$RUN_DIR"
    else
        RUN_DIR=$RESULTS/RUN
    fi

    step report "$bin/testbed" report "$RUN_DIR" || failed report $?

    if [[ -e $RESULTS/last-good ]] || ((DRY_RUN)); then
        step compare "$bin/testbed" compare "$RESULTS/last-good" "$RUN_DIR" || failed compare $?
    else
        log "step $(number compare) compare: no last good run yet: this run becomes the baseline"
    fi

    step dashboard "$bin/testbed" dashboard "$RESULTS" || failed dashboard $?

    if [[ -z $FAILED_STEP ]]; then
        step last-good ln -sfn "$(basename "$RUN_DIR")" "$RESULTS/last-good" ||
            failed last-good $?
    else
        log "step $(number last-good) last-good: left as it was (step $FAILED_STEP failed)"
    fi
    finish
}

main "$@"
