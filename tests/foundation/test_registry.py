import pytest

from hwrun.errors import UnsupportedError
from hwrun.registry import OpImpl, OpRegistry, OpSpec

SPEC = OpSpec(op="demo.op", num_heads=48, formats=("fp8",))


def impl(name, platform="vendor", priority=0, reasons=(), raises=None):
    def validate(spec):
        if raises:
            raise raises
        return list(reasons)

    return OpImpl("demo.op", name, platform, fn=lambda: name, validate=validate, priority=priority)


def vendor_with_fallback(*impls):
    reference = OpRegistry("reference")
    reference.register(impl("reference", platform="reference"))
    vendor = OpRegistry("vendor", fallback=reference)
    for i in impls:
        vendor.register(i)
    return vendor


def test_highest_priority_valid_impl_wins_and_rejections_are_kept():
    registry = vendor_with_fallback(
        impl("best", priority=30, reasons=["heads must be 32 or 64, got 48"]),
        impl("good", priority=20),
        impl("slow", priority=10),
    )
    selection = registry.select(SPEC)
    assert selection.impl.name == "good" and not selection.fallback
    assert selection.rejected == {"best": ["heads must be 32 or 64, got 48"]}


def test_equal_priority_is_ordered_by_name():
    registry = vendor_with_fallback(impl("b"), impl("a"))
    assert [i.name for i in registry.impls("demo.op")] == ["a", "b"]


def test_fallback_to_reference_is_marked():
    registry = vendor_with_fallback(impl("triton", reasons=["no CUDA device"]))
    selection = registry.select(SPEC)
    assert selection.fallback and selection.impl.platform == "reference"
    assert selection.rejected == {"triton": ["no CUDA device"]}


def test_op_absent_on_platform_falls_back_with_a_reason():
    selection = vendor_with_fallback().select(SPEC)
    assert selection.fallback
    assert selection.rejected == {"vendor:*": ["the vendor platform does not implement it"]}


def test_no_fallback_lists_every_impls_reasons():
    registry = vendor_with_fallback(
        impl("deepgemm", priority=2, reasons=["heads must be 32 or 64, got 48"]),
        impl("triton", priority=1, reasons=["no CUDA device", "format fp8 needs sm_89+"]),
    )
    with pytest.raises(UnsupportedError) as err:
        registry.select(SPEC, allow_fallback=False)
    assert err.value.reasons == {
        "deepgemm": ["heads must be 32 or 64, got 48"],
        "triton": ["no CUDA device", "format fp8 needs sm_89+"],
    }
    assert "deepgemm: heads must be 32 or 64, got 48" in str(err.value)
    assert "triton: no CUDA device; format fp8 needs sm_89+" in str(err.value)


def test_fallback_that_also_refuses_reports_both():
    reference = OpRegistry("reference")
    reference.register(impl("reference", platform="reference", reasons=["format unknown"]))
    vendor = OpRegistry("vendor", fallback=reference)
    vendor.register(impl("triton", reasons=["no GPU"]))
    with pytest.raises(UnsupportedError) as err:
        vendor.select(SPEC)
    assert err.value.reasons == {"triton": ["no GPU"], "reference:reference": ["format unknown"]}


def test_pinned_impl_that_cannot_serve_raises_with_its_reasons():
    registry = vendor_with_fallback(impl("deepgemm", reasons=["heads must be 32 or 64"]))
    with pytest.raises(UnsupportedError, match="pinned impl 'deepgemm'") as err:
        registry.select(SPEC, pinned="deepgemm")
    assert err.value.reasons == {"deepgemm": ["heads must be 32 or 64"]}


def test_pinned_impl_wins_over_priority():
    registry = vendor_with_fallback(impl("fast", priority=9), impl("slow", priority=1))
    assert registry.select(SPEC, pinned="slow").impl.name == "slow"


def test_unknown_pinned_impl_names_the_known_ones():
    registry = vendor_with_fallback(impl("triton"))
    with pytest.raises(UnsupportedError, match="impls of this op here: triton"):
        registry.select(SPEC, pinned="cutlass")


def test_validator_that_raises_becomes_a_reason():
    registry = vendor_with_fallback(impl("buggy", priority=5, raises=KeyError("arch")), impl("ok"))
    selection = registry.select(SPEC)
    assert selection.impl.name == "ok"
    assert selection.rejected == {"buggy": ["validate() raised KeyError: 'arch'"]}


def test_duplicate_impl_name_is_refused():
    registry = OpRegistry("vendor")
    registry.register(impl("triton"))
    with pytest.raises(ValueError, match="already has an impl named 'triton'"):
        registry.register(impl("triton"))


def test_impl_for_another_platform_is_refused():
    with pytest.raises(ValueError, match="register it with platform='vendor'"):
        OpRegistry("vendor").register(impl("x", platform="other"))
