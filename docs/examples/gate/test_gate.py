def test_verify_stays_under_the_duplication_bound(twice_eval):
    rates = twice_eval(
        task="refund", model=["stub/retry", "stub/verify"], fault="lost_reply", limit=4
    )
    # The control: if retry does not duplicate, the eval cannot see duplicates at all.
    assert rates.cell(model="stub/retry").duplication_rate == 1.0
    verify = rates.cell(model="stub/verify")
    assert verify.errors == 0 and verify.completion_rate == 1.0
    assert verify.duplication_ci[1] < 0.5  # upper bound of the 95% Wilson interval
