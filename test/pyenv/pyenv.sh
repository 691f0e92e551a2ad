#!/usr/bin/env bash
# pyenv.sh: creates (once) and prints the path of the pinned Python environment of test/pyenv/requirements.txt.
#
# The environment lives outside the repository, in ${FAAS_GPU_CACHE:-$HOME/.cache/faas-gpu}/pyenv-<hash>, keyed by
# the hash of the requirements file, so a change of pins makes a new one and an unchanged file reuses it. pip's own
# download cache (~/.cache/pip) is kept too. About 3.3 GB is downloaded on a cold cache (torch 530 MB, cuDNN, cuBLAS,
# NCCL and the other CUDA 13 wheels) and the environment takes about 5.5 GB on disk.
#
# usage: test/pyenv/pyenv.sh [NAME]          prints the environment's directory (its python is <dir>/bin/python3)
#        test/pyenv/pyenv.sh --check [NAME]  exits 0 if the environment exists and is complete, 1 otherwise
# NAME picks a small extra environment of NAME-requirements.txt beside this script (openai: the OpenAI client for
# the llm function's tests) in pyenv-NAME-<hash>; without it, the CUDA environment of requirements.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=
if [ "${1:-}" = "--check" ]; then
	check=1
	shift
fi
name=${1:-}
case "$name" in
"") req="$here/requirements.txt" prefix=pyenv ;;
*[!a-z0-9]*) echo "pyenv: bad environment name $name" >&2; exit 2 ;;
*) req="$here/$name-requirements.txt" prefix=pyenv-$name ;;
esac
[ -f "$req" ] || { echo "pyenv: no $req" >&2; exit 2; }
cache=${FAAS_GPU_CACHE:-$HOME/.cache/faas-gpu}
hash=$(sha256sum "$req" | cut -c1-12)
dir="$cache/$prefix-$hash"

if [ -n "$check" ]; then
	[ -f "$dir/.complete" ] && exit 0 || exit 1
fi
if [ ! -f "$dir/.complete" ]; then
	python=${PYTHON:-python3}
	mkdir -p "$cache"
	lock="$cache/$prefix-$hash.lock"
	exec 9>"$lock"
	flock 9
	if [ ! -f "$dir/.complete" ]; then
		note=
		[ -n "$name" ] || note=" (cold: about 3.3 GB from PyPI)"
		echo "pyenv: creating $dir from $req$note" >&2
		rm -rf "$dir"
		"$python" -m venv "$dir"
		"$dir/bin/python3" -m pip install -q --disable-pip-version-check --no-deps -r "$req" >&2
		if [ -z "$name" ]; then
			# The nvcc of the wheels finds its cudart and devrt by -L; a plain `-lcudart` needs the unversioned name.
			lib=$("$dir/bin/python3" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')
			[ -e "$lib/libcudart.so" ] || ln -s libcudart.so.13 "$lib/libcudart.so"
		fi
		touch "$dir/.complete"
	fi
fi
echo "$dir"
