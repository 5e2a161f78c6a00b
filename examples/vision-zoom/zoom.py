"""`zoom`: a verl-style image tool over the shapes task's pictures (rlctl data prep shapes-colour).

The model calls zoom with one cell of the picture's 2 x 2 grid (0 top-left, 1 top-right,
2 bottom-left, 3 bottom-right); the tool answers with that cell cut out and scaled up to the
whole canvas (56 x 56 pixels: 4 image tokens of a Qwen2.5-VL layout after the 2 x 2 merge), as an
image in the tool message. The picture is the prompt's first image: rlctl hands it to a verl tool
as create_kwargs["image"] when the row's tools_kwargs name none (verl's image tools read the same key).
"""

from __future__ import annotations

import itertools

CANVAS, CELL = 56, 28


class ZoomTool:
    tool_schema = {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": "Show one cell of the picture's 2 x 2 grid, enlarged.",
            "parameters": {"type": "object",
                           "properties": {"cell": {"type": "integer", "description": "0, 1, 2 or 3"}},
                           "required": ["cell"]},
        },
    }

    def __init__(self):
        self.pictures: dict[int, object] = {}   # instance -> its sample's picture (PIL)
        self.ids = itertools.count()

    def create(self, create_kwargs: dict) -> int:
        key = next(self.ids)
        self.pictures[key] = create_kwargs.get("image")
        return key

    def execute(self, instance: int, parameters: dict):
        picture = self.pictures.get(instance)
        if picture is None:
            return {"text": "error: this sample has no picture to zoom into"}
        try:
            cell = int(parameters.get("cell"))
        except (TypeError, ValueError):
            return {"text": "error: cell must be 0, 1, 2 or 3"}
        if cell not in (0, 1, 2, 3):
            return {"text": "error: cell must be 0, 1, 2 or 3"}
        x, y = (cell % 2) * CELL, (cell // 2) * CELL
        crop = picture.convert("RGB").crop((x, y, x + CELL, y + CELL)).resize((CANVAS, CANVAS))
        return {"text": f"cell {cell}", "images": [crop]}

    def calc_reward(self, instance: int) -> None:
        return None

    def release(self, instance: int) -> None:
        self.pictures.pop(instance, None)


zoom = ZoomTool()
