"""The dense toy reward the learning tests write into their projects as reward.py: the share of
lowercase letters in the response, which even a random tiny model can raise within a few steps."""

DENSE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum("a" <= ch <= "z" for ch in solution_str) / max(len(solution_str), 1)
'''
