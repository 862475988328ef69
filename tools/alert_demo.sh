#!/bin/bash
# The output docs/alerts.md quotes: the x·sigmoid(1.702x)-GELU BERT through a real `fusionwatch serve` and the CLI
# (port 8765, a fresh SQLite database in a temporary folder). FUSIONWATCH_BIN: where fusionwatch is.
set -u
cd "$(dirname "$0")/.."; REPO=$PWD
export PYTHONPATH=$REPO PATH=${FUSIONWATCH_BIN:-$REPO/.venv/bin}:$PATH COLUMNS=160
WORK=$(mktemp -d)
mkdir -p $WORK/a $WORK/b $WORK/c
cp tests/models/bert_torchscript_opset14.onnx $WORK/a/bert.onnx
cp tests/models/bert_quickgelu_torchscript_opset14.onnx $WORK/b/bert.onnx
cp tests/models/bert_torchscript_opset14.onnx $WORK/c/bert.onnx
export FUSIONWATCH_DATABASE_URL=sqlite:///$WORK/fw.db FUSIONWATCH_LOG_LEVEL=WARNING
fusionwatch db upgrade 2>/dev/null
export FUSIONWATCH_TOKEN=$(fusionwatch token create doc-writer 2>/dev/null)
fusionwatch serve --port 8765 --data-dir $WORK/data > $WORK/serve.log 2>&1 &
SERVER=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8765/api/v1/health >/dev/null && break; sleep 1; done
API=http://127.0.0.1:8765/api/v1
curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" -H 'content-type: application/json' $API/projects \
  -d '{"name": "bert-exports", "settings": {"runs": 20, "warmup": 3, "levels": ["extended"], "threads": 1, "sequence_length": 16}}' >/dev/null
A=$(printf 'a%.0s' $(seq 40)); B=$(printf 'b%.0s' $(seq 40)); C=$(printf 'c%.0s' $(seq 40))
echo '$ fusionwatch submit --server $API --project bert-exports --commit aaaa… --wait bert.onnx    # exact GELU'
fusionwatch submit --server $API --project bert-exports --commit $A --message "export with the exact GELU" --wait $WORK/a/bert.onnx 2>/dev/null
echo "exit $?"
echo '$ fusionwatch submit --server $API --project bert-exports --commit bbbb… --parent aaaa… --wait --fail-on-regression bert.onnx    # x·sigmoid(1.702x) GELU'
fusionwatch submit --server $API --project bert-exports --commit $B --parent $A --message "GELU as x*sigmoid(1.702x)" --wait --fail-on-regression $WORK/b/bert.onnx 2>/dev/null
echo "exit $?"
ID=$(curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" "$API/alerts?kind=fusion-regression" | python -c "import json,sys;print(json.load(sys.stdin)['items'][0]['id'])")
echo "\$ curl \$API/alerts/$ID"
curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" "$API/alerts/$ID" | python -c "
import json,sys
a=json.load(sys.stdin)
a['near_misses']=a['near_misses'][:2]+(['… %d more' % (len(a['near_misses'])-2)] if len(a['near_misses'])>2 else [])
a['cause']['near_misses']='(%d, as near_misses above)' % len(a['cause']['near_misses'])
print(json.dumps(a, indent=2, ensure_ascii=False))"
cd $WORK
curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" -OJ "$API/alerts/$ID/repro"
curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" -OJ "$API/alerts/$ID/repro?side=baseline"
ls -l repro-*.onnx | awk '{print $5, $9}'
python - <<PY
from service.usecases.repro import command
import glob
print("\$ " + command("fusionwatch", "extended", "com.microsoft.BiasGelu", sorted(glob.glob("repro-*-commit.onnx")) + sorted(glob.glob("repro-*-baseline.onnx"))))
PY
for f in repro-*-commit.onnx repro-*-baseline.onnx; do fusionwatch optimize $f --level extended --json | python -c "import json,sys;print('$f', json.load(sys.stdin)['ops_after'].get('com.microsoft.BiasGelu', 0))"; done
cd $REPO
echo '$ fusionwatch submit --server $API --project bert-exports --commit cccc… --parent bbbb… --wait --fail-on-regression bert.onnx    # exact GELU again'
fusionwatch submit --server $API --project bert-exports --commit $C --parent $B --message "back to the exact GELU" --wait --fail-on-regression $WORK/c/bert.onnx 2>/dev/null
echo "exit $?"
echo "\$ curl \$API/alerts/$ID  # state, resolved_by"
curl -s -H "Authorization: Bearer $FUSIONWATCH_TOKEN" "$API/alerts/$ID" | python -c "import json,sys;a=json.load(sys.stdin);print(json.dumps({k:a[k] for k in ('state','resolved_by','resolved_at')}, indent=2))"
kill $SERVER
