"""An output handed to the runtime (tests, benchmarks, embedding code) must have every member of
the Output protocol: one lacking some is refused at construction with their names, not found out
by a crash in the frame loop's first publish (the fresh-venv check's daemon died that way)."""

import pytest

from vcam.config import Config
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput, missing_members
from vcam.types import PixelFormat


class Bare:
    fmt, width, height = PixelFormat.BGR, 64, 48

    def send(self, data):
        pass

    def close(self):
        pass


def test_an_output_lacking_protocol_members_is_refused_with_their_names():
    assert "user_closed" in missing_members(Bare())
    with pytest.raises(TypeError, match=r"stream '\w+' \(Bare\).*user_closed.*OutputBase"):
        Daemon(Config(), output=Bare(), control=False)


def test_an_output_base_subclass_has_every_member():
    assert missing_members(NullOutput(64, 48)) == []
