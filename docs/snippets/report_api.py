from twice.reports import trials_frame, write_report

write_report(trials_frame("logs/demo"), "report.html", baseline=trials_frame("logs/before"))
