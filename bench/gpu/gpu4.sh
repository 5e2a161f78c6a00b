set -o pipefail
source bench/gpu/setup_dev.sh
echo "== T: VLM tests on the GPU machine (torchvision present there, transformers 5.17)"
python3 -c "import torchvision;print('torchvision',torchvision.__version__)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/models/test_tiny_vlm.py tests/workers/test_vision.py tests/controller/test_vision_steps.py 2>&1 | tail -4
W=/tmp/g4; rm -rf $W; mkdir -p $W; cd $W
G1="resources.gpus_per_node=1"
rl model tiny models/tiny-vl --arch qwen2_5_vl | tail -1
rl init vl --recipe grpo-shapes-cpu --model ../models/tiny-vl >/dev/null
cd vl && rl data prep shapes-colour >/dev/null 2>&1
echo "== V1: grpo-shapes-cpu (fp32) on the GPU, 150 steps"; t0=$(date +%s)
timeout 200 python3 -m rlctl train $G1 run.total_steps=150 run.val_every=150 run.save_every=150 > train.log 2>&1; echo "rc=$?"; grep -i "validation" train.log; tail -1 train.log
echo "V1 took $(( $(date +%s)-t0 )) s"
timeout 60 python3 -m rlctl merge runs/grpo-shapes-cpu --to-hf ../models/vl-out 2>&1 | tail -2
echo "== V2: bf16, 30 steps"; t0=$(date +%s)
timeout 90 python3 -m rlctl train $G1 model.dtype=bfloat16 run.name=vl-bf16 run.total_steps=30 run.val_every=30 run.save_every=30 > bf16.log 2>&1; echo "rc=$?"; grep -i "validation" bf16.log; tail -1 bf16.log
echo "V2 took $(( $(date +%s)-t0 )) s"
