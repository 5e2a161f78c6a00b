from sum_feedback.harness import InProcessChatHarness
from sum_feedback.taskset import SumFeedbackEnv, SumFeedbackTaskset

__all__ = ["SumFeedbackTaskset", "SumFeedbackEnv", "InProcessChatHarness"]
