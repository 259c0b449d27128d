"""The limit per solver call each Z3 engine runs under: prove has a default (an obligation Z3
cannot decide must come back `unknown`, not hold the check for ever), the bounded engines none;
`--timeout 0` lifts every limit, and a negative one is refused with the value named."""

from __future__ import annotations

from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker import engines, prove
from kvhandoff.model_checker.engines import PROVE_TIMEOUT, EngineOptions, solver_timeout
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec import Config, get_variant


def test_each_engine_gets_its_default_and_zero_lifts_it() -> None:
    assert solver_timeout("prove", None) == PROVE_TIMEOUT
    for engine in ("bmc", "kind", "spacer"):
        assert solver_timeout(engine, None) is None
    for engine in ("prove", "bmc", "kind", "spacer"):
        assert solver_timeout(engine, 0) is None
        assert solver_timeout(engine, 2.5) == 2.5
    with pytest.raises(ValueError, match="got -1"):
        solver_timeout("prove", -1)


def test_prove_runs_under_the_default_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake_prove(variant: Any, config: Config, timeout: Any = None, depth: Any = None) -> Any:
        seen.append(timeout)
        return CheckResult(variant.name, "prove", config, [])

    monkeypatch.setattr(prove, "prove", fake_prove)
    variant, config = get_variant("reference"), Config()
    given = engines.ENGINES["prove"](variant, config, EngineOptions())
    lifted = engines.ENGINES["prove"](variant, config, EngineOptions(timeout=0))
    chosen = engines.ENGINES["prove"](variant, config, EngineOptions(timeout=7))
    assert seen == [PROVE_TIMEOUT, None, 7]
    assert given.extra["solver_timeout_s"] == PROVE_TIMEOUT
    assert lifted.extra["solver_timeout_s"] is None
    assert chosen.extra["solver_timeout_s"] == 7


@pytest.mark.parametrize("command", ["check", "matrix", "review"])
@pytest.mark.parametrize(("value", "says"), [("-1", "got '-1'"), ("soon", "got 'soon'")])
def test_a_bad_timeout_is_refused(
    command: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and says in err
