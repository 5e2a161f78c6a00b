"""A verifiers v1 environment package as `vf-init NAME -T` lays one out, written by the tests: `vf-calc`,
arithmetic questions with a calculator tool (an MCP tool server verifiers starts per episode) and a
feedback turn (its Env asks the model to check its answer), so every episode is multi-turn. Its rubric:
`correct` (the last reply holds the answer, weight 1) and `used_tool` (weight 0.5); its metric `turns`
counts the model's turns.

`write_package(root)` writes it under root/vf_calc and returns root: put root on PYTHONPATH (or sys.path)
and `verifiers:vf-calc` loads it, as an installed package would.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

FILES = {
    "vf_calc/__init__.py": """
        from vf_calc.taskset import VfCalcEnv, VfCalcTaskset

        __all__ = ["VfCalcTaskset", "VfCalcEnv"]
    """,
    "vf_calc/taskset.py": '''
        import verifiers.v1 as vf

        from vf_calc.servers.tool import VfCalcToolset

        QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 + 4?", "7"), ("What is 5 + 1?", "6"),
                     ("What is 6 + 2?", "8"), ("What is 2 + 7?", "9"), ("What is 1 + 1?", "2")]


        class VfCalcData(vf.TaskData):
            answer: str = ""


        class VfCalcTaskConfig(vf.TaskConfig):
            tools: vf.ToolsetConfig = vf.ToolsetConfig()


        class VfCalcTask(vf.Task[VfCalcData, vf.State, VfCalcTaskConfig]):
            @classmethod
            def toolsets(cls, config: VfCalcTaskConfig) -> list[vf.Toolset]:
                return [VfCalcToolset(config.tools)]

            @vf.reward(weight=1.0)
            async def correct(self, trace: vf.Trace) -> float:
                if self.data.name == "raise":
                    raise RuntimeError("vf-calc's rubric broke")
                return float(self.data.answer in (trace.last_reply or ""))

            @vf.reward(weight=0.5)
            async def used_tool(self, trace: vf.Trace) -> float:
                return float(len(trace.tool_messages) > 0)

            @vf.metric
            async def turns(self, trace: vf.Trace) -> float:
                return float(len(trace.assistant_messages))


        class VfCalcConfig(vf.TasksetConfig):
            num_tasks: int = 6
            fail: str = ""
            """"load": load() raises; "reward": the rubric raises mid-episode (tests of bad environments)."""
            task: VfCalcTaskConfig = VfCalcTaskConfig()


        FEEDBACK = "Check it with the calculator tool, then give only the final number."


        class VfCalcEnvConfig(vf.EnvConfig):
            agent: vf.AgentConfig = vf.AgentConfig()
            feedback_turns: int = 1


        class VfCalcEnv(vf.Env[VfCalcEnvConfig]):
            """The agent answers, the environment asks it to check (a user turn), it answers again."""

            async def run(self, task, agents):
                async with agents.agent.interaction(task) as interaction:
                    segment = await interaction.turn()
                    for _ in range(self.config.feedback_turns):
                        if segment.terminated:
                            break
                        segment = await interaction.turn(FEEDBACK)


        class VfCalcTaskset(vf.Taskset[VfCalcTask, VfCalcConfig]):
            def load(self) -> list[VfCalcTask]:
                if self.config.fail == "load":
                    raise RuntimeError("vf-calc cannot load its questions")
                tasks = []
                for i in range(self.config.num_tasks):
                    question, answer = QUESTIONS[i % len(QUESTIONS)]
                    name = "raise" if self.config.fail == "reward" else ""
                    tasks.append(VfCalcTask(VfCalcData(prompt=question, answer=answer, id=str(i), name=name),
                                            self.config.task))
                return tasks
    ''',
    "vf_calc/servers/__init__.py": "",
    "vf_calc/servers/tool.py": '''
        import verifiers.v1 as vf


        class VfCalcToolset(vf.Toolset[vf.ToolsetConfig]):
            TOOL_PREFIX = None   # the tool is offered as plain "calculator"

            @vf.tool
            def calculator(self, expression: str) -> str:
                """Evaluate arithmetic: numbers, + - * / // % ** and parentheses."""
                allowed = set("0123456789+-*/%(). ")
                if not set(expression) <= allowed:
                    return "error: only arithmetic"
                return str(eval(expression))


        if __name__ == "__main__":
            VfCalcToolset.run()
    ''',
}


def write_package(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root
