"""What only reads results and derived numbers: the report and compare. Imports core and derive; never measure
or a model.
"""
