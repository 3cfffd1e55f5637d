"""Finding the docs' runnable shell blocks (tests/docblocks.py)."""

from pathlib import Path

import docblocks
import pytest

ROOT = Path(__file__).resolve().parents[2]

PAGE = """# A page

```sh
not-run --here
```

```sh runnable
dispatch new -- echo one
```

text

```json
{"not": "shell"}
```

```bash runnable
dispatch list
dispatch wait 1
```
"""


def test_only_the_marked_shell_blocks_are_found_with_the_line_of_their_fence():
    assert docblocks.runnable_blocks(PAGE) == [
        docblocks.Block(7, "dispatch new -- echo one\n"),
        docblocks.Block(17, "dispatch list\ndispatch wait 1\n"),
    ]


@pytest.mark.parametrize("fence", ["```runnable", "```python runnable", "```sh", "```sh runnable-not"])
def test_a_block_not_tagged_as_a_runnable_shell_block_is_left_alone(fence):
    assert docblocks.runnable_blocks(f"{fence}\necho hi\n```\n") == []


def test_a_fence_left_open_is_an_error_naming_its_line():
    with pytest.raises(ValueError, match="line 3: a ``` fence is never closed"):
        docblocks.runnable_blocks("text\n\n```sh runnable\necho hi\n")


@pytest.mark.parametrize("page", ["docs/usage.md", "docs/development.md"])
def test_the_pages_the_integration_test_runs_have_runnable_blocks(page):
    # A marker lost in an edit would leave tests/integration/test_doc_blocks.py running nothing.
    assert docblocks.runnable_blocks((ROOT / page).read_text())
