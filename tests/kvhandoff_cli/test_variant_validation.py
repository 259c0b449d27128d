"""Issue 12, part 3: a variant is validated when it is loaded, and its own bugs are exit 2.

Each test is one of the issue's bad cases: a typo in a design option used to change the verdict
silently, a wrong `breaks=` name was never checked, and an exception in a variant's override
printed a traceback with exit 1 (CI reads 1 as "the change breaks a property").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from kvhandoff.spec.config import default_config
from kvhandoff.spec.variants import REFERENCE, Design, Variant, VariantError
from tests.explored import SMALL
from tests.sequential import SEQUENTIAL

SMALL_SET = [arg for kv in SMALL for arg in ("--set", kv)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_a_hyphen_typo_in_a_design_option_is_exit_2_with_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "typo.py",
        "from kvhandoff.spec.variants import REFERENCE\n"
        "\n"
        "VARIANT = REFERENCE.derive(\n"
        '    "typo", "count only", validation="count-only", oversize="truncate"\n'
        ")\n",
    )
    code, out, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path))
    assert code == 2 and out == ""
    assert f"{path}:3:" in err  # the line of the file that built the variant
    assert "validation='count-only'" in err
    assert "'full', 'count_only', 'digest_optional', 'none'" in err
    assert "did you mean 'count_only'?" in err


def test_an_unknown_design_value_is_exit_2_listing_the_allowed_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "sometimes.py",
        "from kvhandoff.spec.variants import REFERENCE\n"
        'VARIANT = REFERENCE.derive("x", "y", validation="sometimes")\n',
    )
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path))
    assert code == 2
    assert "validation='sometimes' is not one of 'full', 'count_only'" in err
    assert "did you mean" not in err  # nothing is close: no guess


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scrub": 0}, "scrub=0 must be True or False"),
        ({"check_generation": "yes"}, "check_generation='yes' must be True or False"),
        ({"release_fence": "drain-ack"}, "did you mean 'drain_ack'?"),
        ({"transfer": None}, "transfer=None is not one of 'push', 'pull'"),
    ],
)
def test_every_design_option_is_a_closed_choice(changes: dict[str, object], message: str) -> None:
    with pytest.raises(VariantError, match=message.replace("(", r"\(").replace("?", r"\?")):
        Design(**changes)  # type: ignore[arg-type]
    with pytest.raises(VariantError):
        REFERENCE.derive("x", "y", **changes)


def test_derive_with_a_misspelt_option_names_the_nearest() -> None:
    with pytest.raises(VariantError, match=r"'validaton' is neither .*did you mean 'validation'"):
        REFERENCE.derive("x", "y", validaton="none")


def test_breaks_must_name_properties(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "breaks.py",
        "from kvhandoff.spec.variants import REFERENCE\n"
        'VARIANT = REFERENCE.derive("x", "y", scrub=False,\n'
        '    breaks=("freed_pages_hold_readable_data",))\n',
    )
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path))
    assert code == 2 and f"{path}:2:" in err
    assert "breaks= names 'freed_pages_hold_readable_data', which is not a property" in err
    assert "did you mean 'freed_pages_hold_no_readable_data'?" in err
    with pytest.raises(VariantError, match=r"breaks= takes a tuple of names"):
        REFERENCE.derive("x", "y", breaks="no_cross_tenant_read")


def test_config_keys_and_values_are_checked() -> None:
    with pytest.raises(VariantError, match=r"'decode_page' is not a config field .*'decode_pages'"):
        REFERENCE.derive("x", "y", config={"decode_page": 2})
    with pytest.raises(VariantError, match=r"decode_pages must be a positive integer, got -1"):
        REFERENCE.derive("x", "y", config={"decode_pages": -1})


def test_an_override_of_no_action_is_rejected_with_the_nearest_name() -> None:
    def keep(config: object, state: object, action: object) -> object:
        return state

    with pytest.raises(VariantError, match=r"'prefil_reject_request', which is no action"):
        Variant("x", "y", step_overrides={"prefil_reject_request": keep})  # type: ignore[dict-item]


def test_an_added_action_must_be_listed_with_its_effect() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class DecodeScrubPage:
        page: int

    def scrub(config: object, state: object, action: object) -> object:
        return state

    with pytest.raises(VariantError, match=r"DecodeScrubPage has no effect"):
        Variant("x", "y", extra_action_types=(DecodeScrubPage,))
    with pytest.raises(VariantError, match=r"extra_action_types"):
        Variant(
            "x",
            "y",
            extra_actions=lambda c, s: [],
            step_overrides={"decode_scrub_page": scrub},  # type: ignore[dict-item]
        )
    ok = Variant(
        "x",
        "y",
        extra_actions=lambda c, s: [],
        step_overrides={"decode_scrub_page": scrub},  # type: ignore[dict-item]
        extra_action_types=(DecodeScrubPage,),
    )
    assert ok.extra_action_types == (DecodeScrubPage,)


OVERRIDE_RAISES = """\
from dataclasses import replace

from kvhandoff.spec.variants import REFERENCE


def placeholder_reject(config, state, action):
    request = state.requests[action.request]
    return replace(state, requests=request.pages_left)  # no such field: AttributeError


VARIANT = replace(
    REFERENCE.derive("raises", "an override with a bug"),
    step_overrides={"prefill_reject_request": placeholder_reject},
)
"""


def test_an_exception_in_an_override_is_exit_2_naming_the_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "raises.py", OVERRIDE_RAISES)
    code, out, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), *SMALL_SET)
    assert code == 2
    assert "Traceback" not in err + out
    assert f"{path}:8: the variant's step override 'prefill_reject_request'" in err
    assert "PrefillRejectRequest(request=1)" in err and "AttributeError" in err


def test_an_exception_in_extra_actions_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "extra.py",
        "from dataclasses import replace\n"
        "from kvhandoff.spec.variants import REFERENCE\n"
        "\n"
        "def more(config, state):\n"
        "    return [1 / 0]\n"
        "\n"
        'VARIANT = replace(REFERENCE, name="extra", extra_actions=more)\n',
    )
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), *SMALL_SET)
    assert code == 2
    assert f"{path}:5: the variant's extra_actions raised ZeroDivisionError" in err


def test_a_syntax_error_names_its_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path, "syntax.py", "from kvhandoff.spec.variants import REFERENCE\nVARIANT = (\n"
    )
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(path))
    assert code == 2 and f"{path}:2: variant file failed to load: SyntaxError" in err


def test_a_declared_break_not_caught_is_reported_and_the_verdict_stands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`scrub=False` alone is caught only by `freed_pages_hold_no_readable_data`: the declared
    cross-tenant read is not caught (reported, exit 0 stays with the verdict), and the freed-page
    violation that was not declared is named."""
    path = write(
        tmp_path,
        "declared.py",
        "from kvhandoff.spec.variants import REFERENCE\n"
        'VARIANT = REFERENCE.derive("declared", "y", scrub=False,\n'
        '    breaks=("no_cross_tenant_read",))\n',
    )
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), *SMALL_SET)
    assert code == 1  # freed_pages_hold_no_readable_data is violated
    assert "expected to break: no_cross_tenant_read; caught: none" in out
    assert "declared in breaks= but NOT caught: no_cross_tenant_read (holds)" in out
    assert "caught but not declared in breaks=: freed_pages_hold_no_readable_data" in out
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), *SMALL_SET, "--json")
    breaks = json.loads(out)["breaks"]
    assert breaks == {
        "expected": ["no_cross_tenant_read"],
        "caught": [],
        "not_caught": {"no_cross_tenant_read": "holds"},
        "not_declared": ["freed_pages_hold_no_readable_data"],
    }


def test_a_safe_protocol_with_a_declared_break_exits_0_and_says_it_was_not_caught(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "safe.py",
        "from kvhandoff.spec.variants import REFERENCE\n"
        'VARIANT = REFERENCE.derive("safe", "y", breaks=("no_cross_tenant_read",))\n',
    )
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), *SMALL_SET)
    assert code == 0 and "verdict: SAFE" in out
    assert "declared in breaks= but NOT caught: no_cross_tenant_read (holds)" in out


def test_the_catalogue_is_valid_and_a_catalogue_config_applies() -> None:
    from kvhandoff.spec.variants import VARIANTS

    for v in VARIANTS:  # each was validated when spec.variants was imported; rebuild to be sure
        assert Variant(**{f: getattr(v, f) for f in Variant.__dataclass_fields__}) == v
    assert REFERENCE.scenario(default_config()) == default_config()
