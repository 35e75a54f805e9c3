"""The example env with every other question one that no reply of the fake server answers
(``What is 9+0?`` with group_size 4: the fake's replies say 0 to 3), so those groups score all 0.
Run: ``python half_signal_env.py serve ...``, as ``example_env.py``."""

from example_env import AdditionEnv

from atroposlib.type_definitions import Item


class HalfSignalEnv(AdditionEnv):
    async def get_next_item(self) -> Item:
        item = await super().get_next_item()
        self.asked = getattr(self, "asked", 0) + 1
        return item if self.asked % 2 else {"question": "What is 9+0?", "answer": "9"}


if __name__ == "__main__":
    HalfSignalEnv.cli()
