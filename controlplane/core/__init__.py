"""The pure decision core: estimators, formulas and the policy. No I/O, no clock, no network libraries."""
