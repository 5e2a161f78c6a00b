"""The dense toy reward the learning tests write into their projects as reward.py: the share of
lowercase letters in the response, which even a random tiny model can raise within a few steps."""

DENSE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum("a" <= ch <= "z" for ch in solution_str) / max(len(solution_str), 1)
'''

# One GRPO step of a grpo-gsm8k project on CPU, rewarded by DENSE_REWARD written as the project's
# dense.py, on its arith data: 4 prompts x 4 samples of up to 8 tokens, one update, no validation and
# no checkpoint. A test appends the keys it is about.
ONE_DENSE_STEP = (
    "resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8",
    "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
    "model.dtype=float32", "model.gradient_checkpointing=false", "run.save_every=0",
    "reward.function=dense.py:compute_score", "reward.workers=1", "data.batch_size=4", "rollout.n=4",
    "actor.mini_batch_size=4", "actor.micro_batch_size=16", "run.total_steps=1",
)
